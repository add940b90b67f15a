"""cdi.controller"""
