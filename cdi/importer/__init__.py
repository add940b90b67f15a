"""cdi.importer"""
