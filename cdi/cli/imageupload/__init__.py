"""`cdi image-upload`: virtctl image-upload, with checks before anything is created, progress, resume
and a summary (`command.py` has the whole story)."""

from cdi.cli.imageupload.command import register

__all__ = ["register"]
