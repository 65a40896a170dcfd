"""Sum over the last axis (a bandwidth-bound row reduction)."""
