"""One forward pass of the target model, priced from the GPU profile and the model architecture."""
