from cdi.cloner.main import entry

entry()
