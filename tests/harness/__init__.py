"""What test modules share: polling, paths, the simulated control plane and its loop, fakes,
request builders, real-backend helpers. Test modules import from here (or from
``tests.fixtures`` and ``tests.builders``), never from one another; ``tests/unit/test_harness.py``
holds them to that."""
