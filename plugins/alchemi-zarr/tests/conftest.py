import sys
from pathlib import Path

# Tests import their shared helpers (zarr_test_helpers) by name; --import-mode=importlib does not
# put this folder on sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["alchemi_core.testing.fixtures"]
