"""cdi.uploadproxy"""
