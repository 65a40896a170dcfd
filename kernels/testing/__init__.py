"""pytest plugins and test tooling: how kernel items share a machine (scheduling), the phase
breakdown (phases_plugin), the persistent compilation cache (compilation_cache_plugin), and
mutation testing of the harness (mutation). Imports the core; never the command line.
"""
