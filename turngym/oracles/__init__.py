"""Credit oracles: small MDPs whose true advantages are known by dynamic programming
(:mod:`turngym.oracles.mdp`). Their text envs are :mod:`turngym.envs.credit_mdps`; the
gradient-validity benchmark on them is :mod:`turngym.credit.exact_oracle`."""
