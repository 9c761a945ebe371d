"""The ``multinode`` tests: a cluster of Linux namespace nodes on this machine (``make test-multinode``)."""
