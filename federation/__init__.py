"""Sites, compute pools, federated jobs, the scheduler and the Flower boundary."""
