"""The Flower App of the Federated Research Portal (imports no Django)."""
