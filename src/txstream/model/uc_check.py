"""Update consistency (uc) decided by APPROX."""
