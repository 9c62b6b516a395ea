"""What every script here needs: the test module's prompt pairs and server helpers, the built llama-server
(found as the eval finds it; override with EXE=...), the default model, and a reader of the first answer token's
top log-probabilities."""
import os, pathlib, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
import test_kv_features as t                                        # noqa: E402  (PAIRS, N, departures)
from _kv_helpers import complete, concurrently, request, server    # noqa: E402,F401
from turbo_llama import build, model                                # noqa: E402

exe = pathlib.Path(os.environ["EXE"]) if "EXE" in os.environ else build.find_tool("llama-server")
mp = model.default_model()


def first_logprobs(r: dict) -> dict:
    """token id -> log-probability of the first answer token's top candidates (n_probs)."""
    return {e["id"]: e["logprob"] for e in r["completion_probabilities"][0]["top_logprobs"]}
