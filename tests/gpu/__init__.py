# Makes tests/gpu a package (module names gpu.conftest, gpu.test_*): a plain `conftest` here would replace
# tests/conftest.py in sys.modules (see tests/slurm/__init__.py).
