export PYTHONPATH=/tmp/wt44-src2 OMP_NUM_THREADS=1 GDACIL_DATA=/tmp/wt44-data GDACIL_BACKBONES=/tmp/wt44-bb
TR='{"none":{"name":"identity"},"sldc":{"name":"sldc_linear","defaults":"paper"},"sldc_recommended":{"name":"sldc_linear"},"hopdc":{"name":"hopdc"},"hopdc_paper":{"name":"hopdc","defaults":"paper"}}'
one() { # dataset strategy lr head_lr
  n=$1-$2-sldcrec
  python -m gdacil run /tmp/wt44-bench/$1.yaml --resume --set name=$n --set "strategy={\"name\":\"$2\",\"defaults\":\"paper\",\"train\":{\"steps\":30,\"lr\":$3,\"head_lr\":$4}}" --set "compensators=$TR" --set heads='{lr_rgda: {rank: 64}}' --set output_dir=/tmp/wt44-extra/$n > /tmp/wt44-extra/$n.log 2>&1
}
mkdir -p /tmp/wt44-extra
(one cifar10 lora_seqft 0.001 0.01; one cifar10 seqft 0.0005 0.005) &
(one openclipart lora_seqft 0.001 0.01; one openclipart seqft 0.0005 0.005) &
wait
