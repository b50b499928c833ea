"""Stateless numeric decisions shared by the controllers: knows GPUs and time, nothing of Kubernetes.

Pure functions on plain numbers and small frozen msgspec Structs: no I/O, no clock (`now` is an
argument), exact arithmetic (integers and `fractions.Fraction`, never float for compared values).
"""
