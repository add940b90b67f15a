"""cdi.embedded"""
