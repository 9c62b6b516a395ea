"""`turbo-llama build`, `prepare`, `patches check`: the pinned source, the prepared tree, the build.

source.py     the pin, the data files, a verified pristine upstream tree
prepare.py    pristine tree -> prepared tree (overlay + patch series)
tools.py      prepared tree -> built and installed llama.cpp tools
installed.py  what the last build installed, and finding a built tool (find_tool)
pywheel.py    `build --python`: the llama-cpp-python wheel on the prepared tree
cli.py        the click commands build, prepare and patches
"""
