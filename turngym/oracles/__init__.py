"""Credit oracles: small envs whose true advantages are known (:mod:`turngym.oracles.mdp`,
:mod:`turngym.oracles.envs`) and the gradient-validity benchmark on them (:mod:`turngym.oracles.exact`)."""
