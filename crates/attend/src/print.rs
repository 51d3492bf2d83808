//! PyTorch-style tensor printing (`tensor([[1.0100, 1.0641], ...])`).
