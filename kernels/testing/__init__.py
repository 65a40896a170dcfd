"""pytest plugins and test tooling: how kernel items share a machine (scheduling), the phase
breakdown (phases_plugin), the persistent compilation cache (compilation_cache_plugin), fault
containment (isolation), faults planted on purpose and the drill that plants them (faults,
drill), and mutation testing of the harness (mutation). Imports the core; never the command
line.
"""
