"""Where runs run: the executor interface, local processes (with their supervisor), Docker, Ray and Kubernetes."""
