"""Simulated downstream providers: real HTTP services that record every real execution.

``server`` speaks HTTP, ``services`` does the business actions, ``faults``
injects failures, ``selectors`` reads the providers' books for tests and the demo.
"""
