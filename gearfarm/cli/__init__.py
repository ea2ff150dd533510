"""The `gearfarm` command: click groups over the packages below."""
