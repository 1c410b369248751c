"""Data-parallel training: several processes train one model on disjoint slices of each
global mini-batch."""
