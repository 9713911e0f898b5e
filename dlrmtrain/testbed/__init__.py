"""A network testbed on one machine (root, network namespaces, tc): a shaped loopback
(shaped_link) and simulated nodes joined by a shaped link (sim_nodes), each with its
own command line; `dlrmtrain train --link-gbit / --sim-nodes` runs training in them."""
