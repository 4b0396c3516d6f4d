pytest_plugins = ["alchemi_core.testing.fixtures"]
