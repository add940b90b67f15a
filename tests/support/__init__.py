"""Test support: running `cdi up`, kubectl and polling helpers shared by every test package."""
