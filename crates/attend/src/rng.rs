//! PyTorch-compatible CPU random number generator (MT19937, uniform and normal draws).
