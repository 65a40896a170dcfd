"""Operations, one package each: spec.py declares it; every other module is an implementation."""
