"""Site-side data sandbox: encrypted datasets, access grants, airlock. Site-side modules import no Django."""
