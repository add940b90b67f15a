"""cdi.kube"""
