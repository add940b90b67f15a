"""cdi.apiserver"""
