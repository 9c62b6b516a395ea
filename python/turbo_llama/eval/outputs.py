"""Result folders that appear whole: a run writes into <out>.partial, which replaces <out> at the end.

A run that fails deletes its .partial folder (no half-written results); one that finishes or is
interrupted (with what it finished, marked so) is renamed into place. A .partial folder left by a run
that was killed outright (SIGKILL) is ours by its name, and the next run with the same --out removes it.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import shutil
from pathlib import Path
from typing import Callable, Iterator

from . import processes


def staging_dir(out: Path) -> Path:
    """<out>.partial, empty: the run writes there, publish() renames it to out at the end."""
    stage = out.with_name(out.name + ".partial")
    if stage.exists():   # a run that was killed outright (SIGKILL) left it: ours, by its name
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    return stage


def publish(stage: Path, out: Path) -> None:
    """Replace out (an earlier run's results, if any) by stage."""
    old = None
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    stage.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def finishing(res: dict, bar, stage: Path, out: Path, write_outputs: Callable[[], None]) -> Iterator[None]:
    """Run the body of a long job: res["status"] ends as done, interrupted or failed; the progress bar is closed and
    every child process stopped whatever happens. A failed job leaves no half-written results (the caller reports
    the reason); a finished or interrupted one writes its outputs and publishes them from `stage` to `out`."""
    try:
        yield
        res["status"] = "done"
    except KeyboardInterrupt:
        res["status"] = "interrupted"
        raise
    except BaseException:
        res["status"] = "failed"
        raise
    finally:
        bar.close()
        processes.stop_all()
        res["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        if res["status"] == "failed":
            shutil.rmtree(stage, ignore_errors=True)
        else:
            write_outputs()
            publish(stage, out)
