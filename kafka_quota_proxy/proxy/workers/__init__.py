"""`--workers N`: a supervisor process and the N proxy processes it starts on one host."""
