"""cdi.uploadserver"""
