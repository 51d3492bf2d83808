//! Initialisers: each notebook's way of creating attention weights, drawing random
//! numbers in PyTorch's order and writing them into the canonical module.
