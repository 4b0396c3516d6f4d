"""A fake plugin whose import fails, as a plugin with a missing dependency would."""

raise ImportError("alchemi_fake_broken needs the package 'not_installed_anywhere'")
