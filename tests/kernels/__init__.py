"""SpecUI's CPU kernels (specui/kernels/): their bits against oneDNN and float32, the build."""
