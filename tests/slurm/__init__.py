# Makes tests/slurm a package (module names slurm.conftest, slurm.test_*). Without it this directory's
# conftest.py would be imported as plain `conftest` and replace tests/conftest.py in sys.modules, which
# breaks `from conftest import ...` in the test modules under tests/.
