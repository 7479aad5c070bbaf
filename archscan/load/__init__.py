"""Load: what the user names, turned into a model that can run.

Takes a target (``file.py:Name``, ``pkg.module:factory``, ``zoo:name``, a ``.pt2``), ``--input``
specs and constructor arguments; gives a ``ModelTarget`` and ``InputSpec``s, the model built on
the meta device wrapped as fake CPU tensors (or for real where values are needed), and the
user's source lines that errors and findings name.

Modules:
    specs       the syntax of ``--input`` and ``--dtype``, checked without importing torch
    targets     targets, ``.pt2`` archives (checked before anything in them is unpickled), inputs
    building    the model on meta / fake / real tensors; the call that runs it
    recording   the dispatch mode that records executed ops; module stacks; output helpers
    frames      which frames are the user's: ``file.py:LINE`` in errors and findings

Light on purpose: the command line imports ``specs`` before torch (a typo costs no torch import).
"""
