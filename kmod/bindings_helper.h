/* SPDX-License-Identifier: GPL-2.0 */
/* The C API the module binds to; bindgen turns it into bindings_generated.rs. */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/io.h>
#include <linux/dma-mapping.h>
#include <linux/delay.h>
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/interrupt.h>
#include <linux/eventfd.h>
