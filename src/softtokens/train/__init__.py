"""RLOO training of one run (Section 4, Appendix A): its settings, the loop, the loss, gradient
clipping, the resume state, FSDP sharding, the memory plan, and the choice of the checkpoint to
test."""
