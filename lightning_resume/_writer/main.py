"""The writer process: ``python .../_writer/main.py SOCKET_FD BUFFER_FD HURRY_FD``. A script, not ``-m``:
a bare package object stands in for ``lightning_resume``, whose ``__init__`` would import torch."""

import os
import sys
import types

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == here:
        del sys.path[0]  # modules of this folder must not shadow top-level ones
    package = types.ModuleType("lightning_resume")
    package.__path__ = [os.path.dirname(here)]
    sys.modules["lightning_resume"] = package
    from lightning_resume._writer.process import serve

    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
