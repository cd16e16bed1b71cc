"""Compute pools, federated jobs, the scheduler, the Flower boundary and the airlock."""
