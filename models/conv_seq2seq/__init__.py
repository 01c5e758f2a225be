"""conv_seq2seq: fairseq's fconv_wmt_en_de."""
