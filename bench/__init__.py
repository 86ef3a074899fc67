"""Benchmarks: interleaved A/B comparisons written to bench/results/ and README.md."""
