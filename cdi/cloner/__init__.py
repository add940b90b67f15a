"""cdi.cloner"""
