"""Typed contracts that more than one layer relies on: the role spec every role process
reads, which iterations are measured, the codes of the fidelity verdict, and the bounded
reading of a file a user named (config, trace and profile files alike).

A leaf package (standard library and pydantic only), so that every layer can import it
without importing another: a contract that lives here cannot drift between its writer
and its readers.
"""
