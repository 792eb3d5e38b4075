"""Test and benchmark support that ships with the package.

Owns: tiny random model directories (:mod:`relaxtrio.testing.tiny_models`) and fakes that stand in
for real parts where a tiny model cannot produce a shape (:mod:`relaxtrio.testing.scripted_engine`),
and scored contexts built from samples and credits for trainer tests and benchmarks
(:mod:`relaxtrio.testing.scored`).
Nothing in the production path imports this package.

May import: anything in relaxtrio.
"""
