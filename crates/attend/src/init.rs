//! Parameter initialisation as `torch.nn.init` and PyTorch's modules perform it.
