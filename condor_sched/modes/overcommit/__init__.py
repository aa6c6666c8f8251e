"""Overcommitting with an interference model (paper 004, Sections 3.3 and 6): up to M jobs per
core, each placed where the predicted degradation is smallest and never beside a program the
model marks dangerous or a pair it predicts ill-matched."""
