"""mt_dnn: MT-DNN, BERT-large with eight GLUE heads."""
