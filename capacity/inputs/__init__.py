"""What is deployed and what arrives: the scenario file, GPU profiles, model architectures, request traffic."""
