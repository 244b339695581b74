from tests.e2e.conftest import workdir  # noqa: F401 - the shared job directory fixture
