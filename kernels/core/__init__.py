"""The measurement core: what every other package stands on.

Owns the registry (operations declared once: reference, inputs, work model, tolerances,
cases; implementations registered against them), the correctness harness (checking), the
bridges to each framework, the one timing path, the device fingerprint, input validation,
what this machine offers (devices), process settings made before any framework import
(environment), JAX/Triton version differences (compat), the HLO rules an implementation may
declare, block-size tuning records, and plain-text tables. Imports nothing of ours outside
itself; finds the operations by name at run time (registry.OPS_PACKAGE).
"""
