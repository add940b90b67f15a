"""cdi.cli"""
